#include "textflag.h"

// func streamBody(dst, src *byte, n uintptr)
TEXT ·streamBody(SB), NOSPLIT, $0-24
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	n+16(FP), BX
	TESTQ	BX, BX
	JZ	done
loop:
	VMOVDQU	(SI), Y0
	VMOVDQU	0x20(SI), Y1
	VMOVDQU	0x40(SI), Y2
	VMOVDQU	0x60(SI), Y3
	VMOVNTDQ	Y0, (DI)
	VMOVNTDQ	Y1, 0x20(DI)
	VMOVNTDQ	Y2, 0x40(DI)
	VMOVNTDQ	Y3, 0x60(DI)
	ADDQ	$0x80, SI
	ADDQ	$0x80, DI
	SUBQ	$0x80, BX
	JNZ	loop
	// Streaming stores are weakly ordered: fence them so every later
	// load or store (another goroutine's included) sees the bytes.
	SFENCE
	VZEROUPPER
done:
	RET
