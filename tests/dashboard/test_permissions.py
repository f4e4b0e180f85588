"""Staff only: anonymous visitors go to the login page, non-staff users are turned away."""

import pytest

from tests.dashboard.conftest import url

JOB = "0" * 32
PAGES = [
    ("zktasks_overview", ()),
    ("zktasks_live", ()),
    ("zktasks_pending", ()),
    ("zktasks_assignments", ()),
    ("zktasks_job_changelist", ()),
    ("zktasks_job_change", (JOB,)),
    ("zktasks_job_retry", (JOB,)),
    ("zktasks_job_cancel", (JOB,)),
    ("zktasks_purge", ()),
    ("zktasks_drain", ("worker-1",)),
    ("zktasks_tree", ()),
    ("zktasks_deadletters", ()),
    ("zktasks_deadletter_requeue", ("0000000000000-0000000000000000",)),
    ("zktasks_deadletter_discard", ("0000000000000-0000000000000000",)),
]


def assert_sent_to_login(response, path):
    assert response.status_code == 302, path
    assert response["Location"].startswith("/admin/login/?next="), response["Location"]


@pytest.mark.parametrize(("name", "args"), PAGES)
def test_anonymous_visitors_are_sent_to_the_login_page(client, zk_settings, name, args):
    path = url(name, *args)
    assert_sent_to_login(client.get(path), path)
    assert_sent_to_login(client.post(path, {"confirm": "yes"}), path)


@pytest.mark.parametrize(("name", "args"), PAGES)
def test_users_who_are_not_staff_are_denied(nonstaff_client, zk_settings, name, args):
    path = url(name, *args)
    assert_sent_to_login(nonstaff_client.get(path), path)
    assert_sent_to_login(nonstaff_client.post(path, {"confirm": "yes"}), path)
    # The login page then tells them this account may not see it.
    page = nonstaff_client.get(path, follow=True).content.decode()
    assert "not authorized to access this page" in page


def test_the_index_row_is_for_staff(staff_client, zk_settings):
    html = staff_client.get("/admin/").content.decode()
    assert 'href="/admin/zktasks/job/"' in html
