print("a3-images")
