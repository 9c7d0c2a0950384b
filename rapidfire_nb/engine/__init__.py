"""The training engine: chunking, scheduling, run state, swaps, checkpoints, events.

Nothing in here imports the notebook or tracking layers; they read the event log.
"""
