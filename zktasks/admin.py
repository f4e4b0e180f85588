"""Put the dashboard in the Django admin: a row on the index, pages under /admin/zktasks/.

django-rq's pattern: an unmanaged model puts "ZooKeeper tasks › Jobs" on the admin index
and its ModelAdmin brings the dashboard's views, each wrapped in `admin_site.admin_view`
(staff only, CSRF, never cached). The views are hooked into the get_urls of whichever
site registers the model, ahead of the site's own patterns, so that /admin/zktasks/ opens
the overview instead of the app index, and a project's urls.py needs nothing beyond
`path("admin/", admin.site.urls)`.
"""

from django.contrib import admin

from . import dashboard
from .models import Job


def is_staff(request) -> bool:
    return bool(request.user.is_active and request.user.is_staff)


def can_manage(request) -> bool:
    """Actions (retry, cancel, purge, drain) need the manage_jobs permission."""
    return is_staff(request) and request.user.has_perm(
        f"{Job._meta.app_label}.manage_jobs")


def hook_urls(admin_site, views) -> None:
    """Serve the dashboard's URLs from `admin_site`, before its own (once per site)."""
    original = admin_site.get_urls
    if getattr(original, "zktasks_dashboard", False):
        return

    def get_urls():
        return views.get_urls() + original()

    get_urls.zktasks_dashboard = True
    admin_site.get_urls = get_urls


class JobAdmin(admin.ModelAdmin):
    """The dashboard's pages; nothing here touches the database's (absent) job table."""

    def __init__(self, model, admin_site):
        super().__init__(model, admin_site)
        from .views import DashboardViews

        self.dashboard = DashboardViews(self)
        hook_urls(admin_site, self.dashboard)

    def get_urls(self):
        return []  # the site hook serves every page, the changelist's name included

    def has_module_permission(self, request):
        return is_staff(request)

    def has_view_permission(self, request, obj=None):
        return is_staff(request)

    def has_change_permission(self, request, obj=None):
        return can_manage(request)

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


admin.site.register(Job, JobAdmin)
dashboard.connect_signals()
