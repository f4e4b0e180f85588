"""Settings of the zktasks demo project, read from the environment (django-environ).

Variables: SECRET_KEY, DEBUG, DATABASE_URL (default: SQLite in var/), ALLOWED_HOSTS,
ZOOKEEPER_HOSTS (default 127.0.0.1:2181), ZKTASKS_ROOT (default /zktasks-demo),
ZKTASKS_AUTH ("user:password" or unset), ZKTASKS_SIGNING_KEY (default: SECRET_KEY),
ZKTASKS_TLS_CA, ZKTASKS_TLS_CERTFILE, ZKTASKS_TLS_KEYFILE, ZKTASKS_TLS_KEYFILE_PASSWORD
(TLS when any is set).
A `.env` file next to manage.py is read too.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env(DEBUG=(bool, False))
environ.Env.read_env(BASE_DIR / ".env")

DEBUG = env("DEBUG")
SECRET_KEY = env("SECRET_KEY", default="demo-only-insecure-key-change-me" if DEBUG else None)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "zktasks",
    "project",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = "project.wsgi.application"

(BASE_DIR / "var").mkdir(exist_ok=True)
DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'var' / 'demo.sqlite3'}"),
}

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TASKS = {
    "default": {
        "BACKEND": "zktasks.backend.ZooKeeperBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "HOSTS": env("ZOOKEEPER_HOSTS", default="127.0.0.1:2181"),
            "ROOT": env("ZKTASKS_ROOT", default="/zktasks-demo"),
            "SESSION_TIMEOUT": env.float("ZKTASKS_SESSION_TIMEOUT", default=10.0),
            "AUTH": env("ZKTASKS_AUTH", default=None),
            "SIGNING_KEY": env("ZKTASKS_SIGNING_KEY", default=None),
            # TLS to the servers' secureClientPort when a CA or a client certificate
            # is given.
            "TLS": {key: value for key, value in (
                ("CA", env("ZKTASKS_TLS_CA", default=None)),
                ("CERTFILE", env("ZKTASKS_TLS_CERTFILE", default=None)),
                ("KEYFILE", env("ZKTASKS_TLS_KEYFILE", default=None)),
                ("KEYFILE_PASSWORD", env("ZKTASKS_TLS_KEYFILE_PASSWORD", default=None)),
            ) if value} or None,
            # One periodic job (the dashboard's Schedules tab; `zktasks schedules`).
            "SCHEDULES": {"heartbeat": {"task": "project.tasks.heartbeat", "every": 30}},
            # Mail goes out at most twice a second, however many workers run (the
            # overview shows the limit next to the queue).
            "RATE_LIMITS": {"emails": "2/s"},
        },
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "zktasks": {"handlers": ["console"], "level": env("ZKTASKS_LOG_LEVEL", default="INFO")},
        # Django's own task lines ("Task id=... state=..."), in the same format: with
        # DEBUG, Django's default config printed them bare, without time or level.
        "django.tasks": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
