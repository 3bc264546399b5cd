"""The handler slots of a worker (worker/slots.py): a take waits for a slot given back, and a
slot given back twice never raises the cap."""

from __future__ import annotations

import logging
import threading

from django_jobqueue.worker.slots import Slots


def test_a_take_waits_until_a_slot_is_given_back():
    slots = Slots(2)
    assert slots.take(0) and slots.take(0)
    assert not slots.take(0.05)
    taken = threading.Event()
    thread = threading.Thread(target=lambda: slots.take() and taken.set())
    thread.start()
    assert not taken.wait(0.1)
    slots.give_back()
    assert taken.wait(10)
    thread.join(10)
    assert slots.taken == 2


def test_a_slot_given_back_twice_is_refused_with_an_error(caplog):
    slots = Slots(1)
    assert slots.take(0)
    slots.give_back()
    with caplog.at_level(logging.ERROR, logger="django_jobqueue.worker.slots"):
        slots.give_back()
    assert "given back twice" in caplog.text
    assert slots.take(0)
    assert not slots.take(0)


def test_many_threads_never_hold_more_than_the_slots_and_none_waits_for_ever():
    """A give-back wakes a waiter only when one waits: under contention no wake-up is lost
    (every thread ends) and no more than `size` slots are ever held at once."""
    slots, guard = Slots(2), threading.Lock()
    held, most, rounds = [0], [0], 300

    def work() -> None:
        for _ in range(rounds):
            assert slots.take(60)
            with guard:
                held[0] += 1
                most[0] = max(most[0], held[0])
            with guard:
                held[0] -= 1
            slots.give_back()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert most[0] <= 2
    assert slots.taken == 0
    assert slots._waiting == 0
