"""The demo of the whole story (make demo) and what the end-to-end tests share with it:
the target cluster (targets.py) and the pipelines' inputs and expected outputs (story.py)."""
