"""The demo app: orders whose fulfilment runs as a small workflow of queued jobs."""
