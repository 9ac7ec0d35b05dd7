print("t910-one")
