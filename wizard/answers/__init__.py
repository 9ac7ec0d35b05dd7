"""Answers: what the wizard asks and how each answer is checked.

Takes a YAML answers file (or stdin, or the interactive screens' values) and gives an immutable, checked
`Answers` (wizard.answers.model) or an `AnswersError` that lists every problem. The questions are data
(spec.py, questions*.py); rules.py checks answers against each other and the hardware/release facts.
"""
