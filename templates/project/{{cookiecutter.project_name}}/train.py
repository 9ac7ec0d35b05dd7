print("{{ cookiecutter.project_name }}")
