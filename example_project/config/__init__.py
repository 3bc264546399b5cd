"""Settings, URLs and WSGI entry point of the example project."""
