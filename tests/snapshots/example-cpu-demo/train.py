print("cpu-demo")
