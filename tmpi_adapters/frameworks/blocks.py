"""The Blocks adapter: MainLoop / GradientDescent models and a Blocks extension."""
