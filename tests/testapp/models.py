from django.db import models


class Order(models.Model):
    """A business row saved in the same transaction as a job."""

    number = models.CharField(max_length=50)

    def __str__(self) -> str:
        return self.number


class RunRecord(models.Model):
    """One handler run, unique per (job, attempt): a second run of an attempt fails to insert."""

    job_id = models.BigIntegerField()
    attempt = models.IntegerField()
    worker_pid = models.IntegerField(default=0)
    started = models.FloatField(default=0.0)
    finished = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job_id", "attempt"], name="testapp_run_once")
        ]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.attempt}"
