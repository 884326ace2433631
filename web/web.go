// Package web holds the frontend's static dashboard (HTML, CSS and script),
// embedded so the binary serves it offline, with no CDN. It owns only the
// assets and their handler; it imports nothing of kvmesh, and the data the
// page shows comes from the frontend's snapshot endpoint
// (/dashboard/api/snapshot), which the page polls.
package web

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed dashboard
var assets embed.FS

// Dashboard serves the dashboard's files; mount it under a prefix with
// http.StripPrefix so that "/" is index.html.
func Dashboard() http.Handler {
	sub, err := fs.Sub(assets, "dashboard")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	fileServer := http.FileServer(http.FS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The page is small and changes with the binary: always revalidate.
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
		fileServer.ServeHTTP(w, r)
	})
}
