print("a3-big")
