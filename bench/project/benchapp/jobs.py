"""The benchmark's handlers, autodiscovered by django_jobqueue."""

import asyncio
import time

import django_jobqueue as jobqueue


@jobqueue.handler("bench.noop")
def noop():
    return None


@jobqueue.handler("bench.async_sleep")
async def async_sleep(seconds=1.0):
    await asyncio.sleep(seconds)


@jobqueue.handler("bench.sleep")
def sleep(seconds=0.02):
    time.sleep(seconds)
