print("a2-mnist")
