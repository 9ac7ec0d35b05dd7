print("t910-spawn")
