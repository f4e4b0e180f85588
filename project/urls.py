"""URLs of the demo project: the sample page and the admin (with the zktasks dashboard)."""

from django.contrib import admin
from django.urls import path

from . import views

urlpatterns = [
    path("", views.index, name="demo-index"),
    path("submit/", views.submit, name="demo-submit"),
    path("admin/", admin.site.urls),
]
