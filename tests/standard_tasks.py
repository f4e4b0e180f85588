"""Tasks written against Django's standard API only (django.tasks' own @task), for the
conformance tests: nothing here names zktasks. Module-level, so a worker (and its task
processes) can import them."""

from datetime import UTC, datetime

from django.tasks import TaskContext, task


@task
def noop(*args, **kwargs):
    return None


@task
async def noop_async(*args, **kwargs):
    return None


@task()
def answer():
    return 42


@task()
async def answer_async():
    return 42


@task
def fails_with_value_error():
    raise ValueError("conformance: a plain failure")


@task
def exits():
    raise SystemExit("conformance: the task called exit")


@task
def interrupts():
    raise KeyboardInterrupt("conformance: the task raised KeyboardInterrupt")


@task
def fails_with_nested_error():
    raise ValueError(ValueError("conformance: the inner error"))


@task(takes_context=True)
def reports_context(context):
    return {
        "is_task_context": isinstance(context, TaskContext),
        "id": context.task_result.id,
        "attempt": context.attempt,
        "status": str(context.task_result.status),
    }


@task
def returns_a_datetime():
    return datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
