print("a3-shell")
