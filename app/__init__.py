"""localspec's application layer (commands, the chat UI, the engine process).

Importing it installs `exits.quiet_uncaught_interrupts`: a Ctrl+C while a localspec program is
still importing, before `exits.run_command` guards it, then ends as at any later moment
("interrupted", exit 130), not with a traceback. Only an uncaught KeyboardInterrupt reaches it.
"""
from .exits import quiet_uncaught_interrupts

quiet_uncaught_interrupts()
