"""phalanx.admission"""
