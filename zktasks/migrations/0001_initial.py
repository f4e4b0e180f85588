# The dashboard's unmanaged model: no table, only its content type and permission.

from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Job",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "job",
                "verbose_name_plural": "jobs",
                "permissions": [
                    ("manage_jobs", "Can retry, cancel and purge jobs and drain workers"),
                ],
                "managed": False,
                "default_permissions": (),
            },
        ),
    ]
