from .exits import quiet_uncaught_interrupts

# Ctrl+C while a localspec program is still importing, before app/exits.py's run_command guards
# it, ends as at any later moment ("interrupted", exit 130), not with a traceback.
quiet_uncaught_interrupts()
