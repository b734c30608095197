"""Metrics for Prometheus, read from the database (``GET /metrics``, docs/observability.md).

- ``jobs.metrics.rollup``: the reaper folds the events table into per-minute
  rows (``MetricRollup``) and all-time sums (``MetricTotal``) per queue and
  operation: counts, and wait and run time histograms. The worker's completion
  path writes nothing for it.
- ``jobs.metrics.collector``: a ``prometheus_client`` collector that reads
  those sums and a few cheap live figures (jobs by state, oldest ready job,
  workers, batch messages, schedule lag) at scrape time. Nothing is counted
  in a process, so any number of workers on any number of machines, restarts
  included, add up to the same figures.
- ``jobs.metrics.buckets``: the histograms' fixed bucket bounds.
- ``jobs.metrics.series``: the dashboard's charts, per window, queue and
  operation, read from the minutes and from the quarters and hours
  ``jobs.metrics.spans`` folds them into (SQL in ``jobs.metrics.grouping``).
"""
