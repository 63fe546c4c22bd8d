"""The trace folder on disk: the per-rank ring files and their format, reading them back,
writes that survive a full disk, the watchdog-to-rank request files, and PyTorch Flight
Recorder dumps. No torch import: a folder copied from a cluster reads on a laptop."""
