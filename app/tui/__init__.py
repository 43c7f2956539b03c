"""The Textual chat UI (`localspec chat`). Only the app imports Textual; engine/ and models/ never do."""
