"""The process runtime under training: Horovod init and every collective (`dist`), its
settings (`hvd_settings`), CPU and GPU placement, gradient buckets, the bounded-time
launcher, watchdog and stall rules, preemption signals, faults and crash reports.

Nothing here knows about tasks, models or the training loop.
"""
