"""manage.py jobqueue_pause: stop workers from starting the jobs of queues, resources or
workflows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_jobqueue import conf, pausing, validation
from django_jobqueue.exceptions import InvalidJobError
from django_jobqueue.models import Job


def check_names(names: list[str]) -> None:
    """Raise CommandError unless every name is a valid queue name (before any write)."""
    for name in names:
        try:
            validation.check_label("queue", name, 100)
        except InvalidJobError as exc:
            raise CommandError(str(exc)) from None


def add_targets(parser: Any, verb: str) -> None:
    """The arguments of jobqueue_pause and jobqueue_resume: queues, --resource, --workflow."""
    parser.add_argument("queues", nargs="*", metavar="queue", help="Queue names.")
    parser.add_argument(
        "--resource",
        action="append",
        default=[],
        metavar="NAME",
        help=f"{verb} a resource ('tenant:42') or every resource of a pattern ('tenant:*'). "
        "Repeatable.",
    )
    parser.add_argument(
        "--workflow",
        action="append",
        default=[],
        metavar="JOB_ID",
        help=f"{verb} a job and every job under it (a container's children). Repeatable.",
    )


def checked_targets(options: dict[str, Any]) -> tuple[list[str], list[str], list[int]]:
    """The queues, resources and workflow job ids of `options`, all checked before any write."""
    queues, resources, workflows = options["queues"], options["resource"], options["workflow"]
    if not (queues or resources or workflows):
        raise CommandError("Name at least one queue, --resource NAME or --workflow JOB_ID.")
    check_names(queues)
    for name in resources:
        try:
            pausing.check_resource(name)
        except InvalidJobError as exc:
            raise CommandError(str(exc)) from None
    ids = []
    for text in workflows:
        try:
            pk = int(text)
        except ValueError:
            raise CommandError(f"--workflow takes a job id, not {text!r}.") from None
        if not 1 <= pk <= validation.ID_MAX:
            raise CommandError(f"Job {pk} does not exist.")
        ids.append(pk)
    found = set(
        Job.objects.using(conf.get().database).filter(pk__in=ids).values_list("pk", flat=True)
    )
    missing = [pk for pk in ids if pk not in found]
    if missing:
        raise CommandError(f"Job {missing[0]} does not exist: nothing was changed.")
    return queues, resources, ids


def act(
    out: Callable[[str], Any], targets: tuple[list[str], list[str], list[int]], pause: bool
) -> None:
    """Pause (or resume) each target and say what changed."""
    queues, resources, ids = targets
    done, undone = ("Paused", "paused already") if pause else ("Resumed", "not paused")
    steps: list[tuple[str, Any, Callable[[Any], bool]]] = [
        *[
            ("queue", name, pausing.pause_queue if pause else pausing.resume_queue)
            for name in queues
        ],
        *[
            ("resource", name, pausing.pause_resource if pause else pausing.resume_resource)
            for name in resources
        ],
        *[
            ("workflow", pk, pausing.pause_workflow if pause else pausing.resume_workflow)
            for pk in ids
        ],
    ]
    for kind, target, change in steps:
        shown = f"#{target}" if kind == "workflow" else repr(target)
        if change(target):
            out(f"{done} {kind} {shown}.")
        else:
            out(f"{kind.capitalize()} {shown} was {undone}.")


class Command(BaseCommand):
    help = (
        "Pause queues, resources (--resource) or workflows (--workflow): workers start none "
        "of their jobs (within FAIR_SHARE_REFRESH seconds) until jobqueue_resume; running "
        "jobs finish."
    )

    def add_arguments(self, parser: Any) -> None:
        add_targets(parser, "Pause")

    def handle(self, *args: Any, **options: Any) -> None:
        act(self.stdout.write, checked_targets(options), pause=True)
