package frontend

// maxTokens is how many tokens a request may generate before the context
// check: the client's max_tokens, else the model's default raised to
// min_tokens; a 400 above Config.MaxTokensLimit.
func (s *Server) maxTokens(m *Model, p genParams) (int, *apiError) {
	limit := s.cfg.MaxTokensLimit
	if p.MaxTokens > 0 {
		if limit > 0 && p.MaxTokens > limit {
			return 0, invalid(p.maxTokensParam, "'%s' is %d, above this server's limit of %d tokens per request", p.maxTokensParam, p.MaxTokens, limit)
		}
		return p.MaxTokens, nil
	}
	if limit > 0 && p.MinTokens > limit {
		return 0, invalid("min_tokens", "'min_tokens' is %d, above this server's limit of %d tokens per request", p.MinTokens, limit)
	}
	n := max(m.DefaultMaxTokens, p.MinTokens)
	if limit > 0 {
		n = min(n, limit)
	}
	return n, nil
}
