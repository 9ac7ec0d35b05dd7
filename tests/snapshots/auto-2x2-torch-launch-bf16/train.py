print("auto-launch")
