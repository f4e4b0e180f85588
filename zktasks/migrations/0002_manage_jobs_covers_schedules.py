# The permission's description names every dashboard action it allows. Django creates
# missing permissions after migrate but does not rename existing ones: a database made
# before this keeps the older text, with the same meaning (the codename is unchanged).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("zktasks", "0001_initial"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="job",
            options={
                "verbose_name": "job",
                "verbose_name_plural": "jobs",
                "permissions": [
                    ("manage_jobs", "Can retry, cancel and purge jobs, drain workers, "
                                    "re-queue or discard dead letters, and pause, resume "
                                    "or run schedules"),
                ],
                "managed": False,
                "default_permissions": (),
            },
        ),
    ]
