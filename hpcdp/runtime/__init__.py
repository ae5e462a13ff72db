"""The process runtime under training: Horovod init and every collective (`dist`), the
Horovod environment (`hvd_settings`), threads and yielding (`thread_plan`), CPU and GPU
placement, gradient buckets, the bounded-time launcher, watchdog and stall rules,
preemption signals, faults and crash reports.

Nothing here knows about tasks, models or the training loop.
"""
