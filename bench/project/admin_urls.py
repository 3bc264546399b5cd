"""The admin, alone: the URLs of the admin scale benchmark."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
