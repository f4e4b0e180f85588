"""The Django app config of zktasks."""

from django.apps import AppConfig


class ZkTasksConfig(AppConfig):
    name = "zktasks"
    verbose_name = "ZooKeeper tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import client

        client.connect_signals()
