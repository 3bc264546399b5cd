"""App configuration of the shop demo."""

from __future__ import annotations

from django.apps import AppConfig


class ShopConfig(AppConfig):
    """The shop app; django_jobqueue autodiscovers its ``jobs.py``."""

    name = "shop"
    default_auto_field = "django.db.models.BigAutoField"
