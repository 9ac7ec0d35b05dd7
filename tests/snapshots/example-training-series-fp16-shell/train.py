print("atlas910-shell")
