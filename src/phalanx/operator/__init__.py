"""phalanx.operator"""
