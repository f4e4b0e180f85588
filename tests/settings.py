"""Settings for the test suite; ZooKeeper hosts and root come from the environment so
that runworker subprocesses started by tests share the test's tree."""

import os

SECRET_KEY = "tests-secret-key-not-for-production"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "zktasks",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TASKS = {
    "default": {
        "BACKEND": "zktasks.backend.ZooKeeperBackend",
        "QUEUES": [],
        "OPTIONS": {
            "HOSTS": os.environ.get("ZKTASKS_TEST_HOSTS", "127.0.0.1:2181"),
            "ROOT": os.environ.get("ZKTASKS_TEST_ROOT", "/zktasks-tests"),
            "SESSION_TIMEOUT": float(os.environ.get("ZKTASKS_TEST_SESSION_TIMEOUT", "4")),
            "CONNECT_TIMEOUT": float(os.environ.get("ZKTASKS_TEST_CONNECT_TIMEOUT", "10")),
        },
    },
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"zktasks": {"handlers": ["console"],
                            "level": os.environ.get("ZKTASKS_LOG_LEVEL", "WARNING")}},
}
