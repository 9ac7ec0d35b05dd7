print("a2-torchrun")
