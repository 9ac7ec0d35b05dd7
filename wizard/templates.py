"""`python -m wizard.templates`: regenerate the template's cookiecutter.json after changing the questions.

The template code itself lives in wizard/render/templates.py; this entry point stays here so the documented
developer command keeps its name.
"""

from wizard.render.templates import write_cookiecutter_json

if __name__ == "__main__":
    print(f"wrote {write_cookiecutter_json()}")
