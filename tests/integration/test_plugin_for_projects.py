"""The pytest plugin as another project uses it: its own settings module, its own tasks,
and only the plugin's fixtures (no conftest of this suite). Run in a pytest of its own."""

import textwrap

pytest_plugins = ["pytester"]

SETTINGS = """
    SECRET_KEY = "plugin-test"
    USE_TZ = True
    INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "zktasks"]
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    TASKS = {
        "default": {
            "BACKEND": "zktasks.backend.ZooKeeperBackend",
            "QUEUES": ["default", "emails"],
            # Production's: unreachable from a test, and TLS the test server lacks.
            "OPTIONS": {"HOSTS": "127.0.0.1:1", "ROOT": "/production",
                        "TLS": {"CA": "/etc/no-such-ca.pem"}, "SESSION_TIMEOUT": 5.0,
                        "SCHEDULES": {"beat": {"task": "myproject_tasks.double",
                                               "every": 1, "args": [1]}}},
        }
    }
"""

TASKS = """
    from zktasks import zk_task

    @zk_task
    def double(x):
        return 2 * x

    @zk_task(queue_name="emails")
    def follow_up(x):
        return double.submit(x).id  # submitted from the job: where does it go?
"""

TEST = """
    from django.tasks import task_backends

    from myproject_tasks import double, follow_up


    def test_a_job_runs_on_the_tests_own_root(zk_settings, zk_worker, zk_client, zk_root):
        options = zk_settings.TASKS["default"]["OPTIONS"]
        assert options["ROOT"] == zk_root and "TLS" not in options
        assert "SCHEDULES" not in options  # a worker of the test would run them
        assert options["SESSION_TIMEOUT"] == 5.0  # the project's own options are kept
        assert zk_settings.TASKS["default"]["QUEUES"] == ["default", "emails"]
        zk_worker(queues=["default", "emails"])
        assert double.submit(21).wait(timeout=60).return_value == 42
        assert zk_client.exists(zk_root)
        # A job submitted by a job (on the worker's thread) lands on the test's root too.
        child_id = follow_up.submit(4).wait(timeout=60).return_value
        assert double.get_result(child_id).wait(timeout=60).return_value == 8


    LEFT = {}


    def test_one_that_leaves_the_server_down(zookeeper, zk_root, zk_client):
        zk_client.ensure_path(f"{zk_root}/something")
        LEFT["root"] = zk_root
        zookeeper.stop()  # its root is still deleted afterwards (the server revived)


    def test_the_next_one_finds_the_server_up_and_the_root_gone(zk_client):
        assert LEFT["root"] and not zk_client.exists(LEFT["root"])


    def test_the_settings_are_the_projects_again_after_a_test():
        from django.conf import settings

        assert settings.TASKS["default"]["OPTIONS"]["ROOT"] == "/production"
        assert task_backends["default"].options["ROOT"] == "/production"
"""


def test_zk_settings_and_zk_worker_serve_another_project(pytester):
    pytester.makepyfile(
        myproject_settings=textwrap.dedent(SETTINGS),
        myproject_tasks=textwrap.dedent(TASKS),
        test_myproject=textwrap.dedent(TEST),
    )
    # A pytest of its own: its session starts its own ZooKeeper through the plugin,
    # which loads itself through the package's entry point.
    # --ds: the command line wins over this suite's DJANGO_SETTINGS_MODULE, inherited.
    result = pytester.runpytest_subprocess("--ds", "myproject_settings",
                                           "-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=4)
