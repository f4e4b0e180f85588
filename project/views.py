"""The demo's page: submit sample tasks and watch their results."""

from django.shortcuts import redirect, render
from django.tasks.exceptions import TaskResultDoesNotExist
from django.views.decorators.http import require_POST

import zktasks
from zktasks import ZkTasksError

from . import tasks

SAMPLES = {
    "add": lambda: tasks.add.submit(2, 3),
    "fibonacci": lambda: tasks.fibonacci.submit(30),
    "divide": lambda: tasks.divide.submit(1, 0),
    "slow": lambda: tasks.slow.submit(5),
    "email": lambda: tasks.send_welcome.submit("ada@example.com"),
}
SESSION_KEY = "zktasks_demo_jobs"


def index(request):
    results, error = [], None
    for job_id in request.session.get(SESSION_KEY, [])[-20:][::-1]:
        try:
            results.append(tasks.add.get_backend().get_result(job_id))
        except TaskResultDoesNotExist:
            continue
        except ZkTasksError as exc:
            error = str(exc)
            break
    return render(request, "demo/index.html",
                  {"results": results, "samples": SAMPLES, "error": error})


@require_POST
def submit(request):
    names = list(SAMPLES) if request.POST.get("sample") == "all" else [request.POST.get("sample")]
    ids = request.session.get(SESSION_KEY, [])
    # Several submits from one view: sent together, all written when the block ends.
    with zktasks.pipelined():
        for name in names:
            if name in SAMPLES:
                ids.append(SAMPLES[name]().id)
    request.session[SESSION_KEY] = ids[-50:]
    return redirect("demo-index")
