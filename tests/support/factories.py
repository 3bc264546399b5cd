"""factory-boy factories for jobs and edges."""

from __future__ import annotations

import factory

from django_jobqueue.models import Job, JobDependency


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    type = "test.noop"
    args = factory.LazyFunction(dict)
    state = Job.State.READY


class JobDependencyFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = JobDependency

    job = factory.SubFactory(JobFactory)
    depends_on = factory.SubFactory(JobFactory)
