print("cpu-shell")
