"""Handlers for the workflow tests (imported by jobs.py so that they are registered)."""

from __future__ import annotations
