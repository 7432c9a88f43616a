"""batchtop's front ends: the click CLI, the headless driver glue and the Textual dashboard.

Importing this package (or tui.cli) loads no Textual: the dashboard is imported only when it runs.
"""
