"""Parallelisms composed: a layout's memory and step time from the lectures' closed forms (`layout`:
choosing one), and the execution on real ranks of a plan that the Alpa planner searched
(`plan`): stages on submeshes, sharded inside. The rank-side entry point and its reference are in
`edulib.lessons.plans`; the data x pipeline x tensor grid is the trainer's (`edulib.train`).
"""
