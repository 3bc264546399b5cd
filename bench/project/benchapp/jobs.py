"""The benchmark's handlers, autodiscovered by django_jobqueue."""

import asyncio

import django_jobqueue as jobqueue


@jobqueue.handler("bench.noop")
def noop():
    return None


@jobqueue.handler("bench.async_sleep")
async def async_sleep(seconds=1.0):
    await asyncio.sleep(seconds)
