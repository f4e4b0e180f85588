"""Fixtures of the dashboard tests: users of each kind, URLs. (Each test's clean live
cache comes from tests/conftest.py, for the whole suite.)"""

import pytest
from django.urls import reverse


@pytest.fixture
def staff_client(client, django_user_model):
    """A staff user without the manage_jobs permission: may look, may not act."""
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(user)
    return client


@pytest.fixture
def manager_client(client, django_user_model):
    """A staff user with the manage_jobs permission (not a superuser)."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("manager", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="manage_jobs"))
    client.force_login(user)
    return client


@pytest.fixture
def nonstaff_client(client, django_user_model):
    user = django_user_model.objects.create_user("visitor", password="pw")
    client.force_login(user)
    return client


def url(name, *args, **query):
    from django.utils.http import urlencode

    path = reverse(f"admin:{name}", args=args)
    return f"{path}?{urlencode(query)}" if query else path


@pytest.fixture(scope="session")
def _static_for_browser(tmp_path_factory):
    """Serve the admin's and the dashboard's static files from the live server.

    The suite's settings have no staticfiles app, so the live server serves STATIC_ROOT
    at STATIC_URL: copy both apps' static files there, for the whole session (the live
    server is session-wide and reads STATIC_URL when it starts).
    """
    import shutil
    from pathlib import Path

    import django.contrib.admin
    from django.test import override_settings

    import zktasks

    root = tmp_path_factory.mktemp("static")
    for package in (django.contrib.admin, zktasks):
        shutil.copytree(Path(package.__file__).parent / "static", root, dirs_exist_ok=True)
    with override_settings(STATIC_URL="/static/", STATIC_ROOT=str(root)):
        yield root


@pytest.fixture(scope="session")
def live_server(_static_for_browser, live_server):
    """pytest-django's live server, started once the static files are in place."""
    return live_server
