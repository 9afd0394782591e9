"""Parallelisms composed on real ranks: the execution of a plan that the Alpa planner searched
(`plan`): stages on submeshes, sharded inside. The rank-side entry point and its reference are in
`edulib.lessons.plans`; the data x pipeline x tensor grid is the trainer's (`edulib.train`).
"""
