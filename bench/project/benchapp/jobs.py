"""The benchmark's handlers, autodiscovered by django_jobqueue."""

import django_jobqueue as jobqueue


@jobqueue.handler("bench.noop")
def noop():
    return None
