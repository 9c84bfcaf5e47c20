"""Tool calling for the chat API: the request side (tools, tool_choice, grammars for forced
calls), the model-family parsers and their streaming form."""
