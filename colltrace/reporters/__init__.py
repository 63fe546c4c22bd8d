"""Reporters: findings (the analyzer's structured facts) rendered for people. `text` gives the
paragraphs, the "Look first" advice and the stack classes for the CLI, stderr and the dashboard."""
