import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from django_jobqueue.worker import JobWorker, WorkerOptions


@pytest.mark.django_db(transaction=True)
def test_worker_runs_a_dag_in_burst_mode():
    a = jobqueue.enqueue("test.add", {"a": 1, "b": 2})
    b = jobqueue.enqueue("test.add", {"a": 3, "b": 4})
    c = jobqueue.enqueue("test.upstream_sum", depends_on=[a, b])
    assert Job.objects.get(pk=c.pk).state == Job.State.WAITING
    code = JobWorker(WorkerOptions(concurrency=2, burst=True)).run(install_signals=False)
    assert code == 0
    c.refresh_from_db()
    assert c.state == Job.State.DONE, c.last_error
    assert c.result == 10


def test_dir_lists_the_lazy_public_names() -> None:
    import django_jobqueue

    assert set(django_jobqueue.__all__) <= set(dir(django_jobqueue))
