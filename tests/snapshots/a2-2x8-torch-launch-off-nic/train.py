print("a2-launch")
