print("a3-cluster")
